"""Question templates over the generated shop and university databases (see :mod:`agentrl.envs.sql.questions`)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

from agentrl.envs.sql.template_kit import Question, lit, values
from agentrl.envs.sql.template_kit import make_question as _q


# --------------------------------------------------------------------------- shop
def shop_questions(con: sqlite3.Connection) -> Iterator[Question]:
    for country in values(con, "SELECT DISTINCT country FROM customers ORDER BY 1"):
        yield _q(
            "customers_in_country",
            1,
            f"How many customers are from {country}?",
            f"SELECT COUNT(*) FROM customers WHERE country = {lit(country)}",
        )
    for city in values(con, "SELECT DISTINCT city FROM customers ORDER BY 1"):
        yield _q(
            "customer_names_city",
            1,
            f"List the first and last names of the customers who live in {city}.",
            f"SELECT first_name, last_name FROM customers WHERE city = {lit(city)}",
        )
        yield _q(
            "orders_from_city",
            2,
            f"How many orders were placed by customers who live in {city}?",
            "SELECT COUNT(*) FROM orders o JOIN customers c ON o.customer_id = c.customer_id "
            f"WHERE c.city = {lit(city)}",
        )
    for status in values(con, "SELECT DISTINCT status FROM orders ORDER BY 1"):
        yield _q(
            "orders_with_status",
            1,
            f"How many orders have the status '{status}'?",
            f"SELECT COUNT(*) FROM orders WHERE status = {lit(status)}",
        )
    for stock in (10, 20, 30):
        yield _q(
            "low_stock",
            1,
            f"List the names of the products with fewer than {stock} units in stock.",
            f"SELECT name FROM products WHERE stock < {stock}",
        )
    for name in values(con, "SELECT name FROM products ORDER BY 1"):
        yield _q(
            "product_price",
            1,
            f"What is the price of the product '{name}'?",
            f"SELECT price FROM products WHERE name = {lit(name)}",
        )
        yield _q(
            "product_units_sold",
            2,
            f"How many units of '{name}' were sold in total, over all orders that were not cancelled?",
            "SELECT SUM(oi.quantity) FROM order_items oi JOIN products p ON oi.product_id = p.product_id "
            f"JOIN orders o ON o.order_id = oi.order_id WHERE p.name = {lit(name)} AND o.status != 'cancelled'",
        )
    for cat in values(con, "SELECT name FROM categories ORDER BY 1"):
        yield _q(
            "products_in_category",
            2,
            f"List the names of the products in the category '{cat}'.",
            "SELECT p.name FROM products p JOIN categories c ON p.category_id = c.category_id "
            f"WHERE c.name = {lit(cat)}",
        )
        yield _q(
            "category_revenue",
            3,
            f"What is the total revenue (quantity times unit price) of delivered orders for products in the "
            f"category '{cat}'? Round to 2 decimal places.",
            "SELECT ROUND(SUM(oi.quantity * oi.unit_price), 2) FROM order_items oi JOIN products p ON "
            "oi.product_id = p.product_id JOIN categories c ON p.category_id = c.category_id JOIN orders o "
            f"ON o.order_id = oi.order_id WHERE c.name = {lit(cat)} AND o.status = 'delivered'",
        )
    for first, last in con.execute(
        "SELECT first_name, last_name FROM customers ORDER BY customer_id LIMIT 60"
    ):
        yield _q(
            "orders_by_customer",
            2,
            f"How many orders did {first} {last} place?",
            "SELECT COUNT(*) FROM orders o JOIN customers c ON o.customer_id = c.customer_id "
            f"WHERE c.first_name = {lit(first)} AND c.last_name = {lit(last)}",
        )
    for month in values(con, "SELECT DISTINCT substr(order_date, 1, 7) FROM orders ORDER BY 1 LIMIT 24"):
        yield _q(
            "customers_in_month",
            2,
            f"How many distinct customers placed an order in the month {month}?",
            f"SELECT COUNT(DISTINCT customer_id) FROM orders WHERE substr(order_date, 1, 7) = {lit(month)}",
        )
    for year in ("2023", "2024"):
        yield _q(
            "revenue_year",
            3,
            f"What was the total revenue (quantity times unit price) of delivered orders placed in {year}? "
            "Round to 2 decimal places.",
            "SELECT ROUND(SUM(oi.quantity * oi.unit_price), 2) FROM order_items oi JOIN orders o ON "
            f"o.order_id = oi.order_id WHERE o.status = 'delivered' AND strftime('%Y', o.order_date) = {lit(year)}",
        )
    for k in (3, 5):
        yield _q(
            "top_products_revenue",
            3,
            f"Which {k} products generated the most revenue (quantity times unit price) over orders that were "
            "not cancelled? List the product names, the highest revenue first.",
            "SELECT p.name FROM order_items oi JOIN products p ON oi.product_id = p.product_id JOIN orders o "
            "ON o.order_id = oi.order_id WHERE o.status != 'cancelled' GROUP BY p.product_id "
            f"ORDER BY SUM(oi.quantity * oi.unit_price) DESC LIMIT {k}",
            ordered=True,
            limit=k,
            tie_sql="SELECT ROUND(SUM(oi.quantity * oi.unit_price), 2) FROM order_items oi JOIN orders o ON "
            "o.order_id = oi.order_id WHERE o.status != 'cancelled' GROUP BY oi.product_id ORDER BY 1 DESC",
        )
    for city in values(con, "SELECT DISTINCT city FROM customers ORDER BY 1"):
        yield _q(
            "top_customer_city",
            3,
            f"Which customer from {city} placed the most orders? Give the first and last name.",
            "SELECT c.first_name, c.last_name FROM customers c JOIN orders o ON o.customer_id = c.customer_id "
            f"WHERE c.city = {lit(city)} GROUP BY c.customer_id ORDER BY COUNT(*) DESC LIMIT 1",
            ordered=True,
            limit=1,
            tie_sql="SELECT COUNT(*) FROM customers c JOIN orders o ON o.customer_id = c.customer_id "
            f"WHERE c.city = {lit(city)} GROUP BY c.customer_id ORDER BY 1 DESC",
        )
    for cat in values(con, "SELECT name FROM categories ORDER BY 1"):
        yield _q(
            "top_product_category",
            3,
            f"Which product in the category '{cat}' sold the most units over all orders that were not cancelled?",
            "SELECT p.name FROM products p JOIN categories c ON p.category_id = c.category_id JOIN order_items oi "
            "ON oi.product_id = p.product_id JOIN orders o ON o.order_id = oi.order_id "
            f"WHERE c.name = {lit(cat)} AND o.status != 'cancelled' GROUP BY p.product_id "
            "ORDER BY SUM(oi.quantity) DESC LIMIT 1",
            ordered=True,
            limit=1,
            tie_sql="SELECT SUM(oi.quantity) FROM products p JOIN categories c ON p.category_id = c.category_id "
            "JOIN order_items oi ON oi.product_id = p.product_id JOIN orders o ON o.order_id = oi.order_id "
            f"WHERE c.name = {lit(cat)} AND o.status != 'cancelled' GROUP BY p.product_id ORDER BY 1 DESC",
        )
    yield _q(
        "never_ordered",
        3,
        "List the first and last names of the customers who never placed an order.",
        "SELECT first_name, last_name FROM customers WHERE customer_id NOT IN (SELECT customer_id FROM orders)",
    )
    yield _q(
        "priciest_category",
        3,
        "Which category has the highest average product price?",
        "SELECT c.name FROM categories c JOIN products p ON p.category_id = c.category_id GROUP BY c.category_id "
        "ORDER BY AVG(p.price) DESC LIMIT 1",
        ordered=True,
        limit=1,
        tie_sql="SELECT ROUND(AVG(price), 4) FROM products GROUP BY category_id ORDER BY 1 DESC",
    )
    yield _q(
        "busiest_city",
        3,
        "Customers from which city placed the most orders?",
        "SELECT c.city FROM orders o JOIN customers c ON o.customer_id = c.customer_id GROUP BY c.city "
        "ORDER BY COUNT(*) DESC LIMIT 1",
        ordered=True,
        limit=1,
        tie_sql="SELECT COUNT(*) FROM orders o JOIN customers c ON o.customer_id = c.customer_id "
        "GROUP BY c.city ORDER BY 1 DESC",
    )
    for n in (7, 8, 9):
        yield _q(
            "frequent_customers",
            3,
            f"List the first and last names of the customers who placed more than {n} orders.",
            "SELECT c.first_name, c.last_name FROM customers c JOIN orders o ON o.customer_id = c.customer_id "
            f"GROUP BY c.customer_id HAVING COUNT(*) > {n}",
        )


# --------------------------------------------------------------------------- university
def university_questions(con: sqlite3.Connection) -> Iterator[Question]:
    for year in values(con, "SELECT DISTINCT enrollment_year FROM students ORDER BY 1"):
        yield _q(
            "students_in_year",
            1,
            f"How many students enrolled in {year}?",
            f"SELECT COUNT(*) FROM students WHERE enrollment_year = {year}",
        )
    for credits in values(con, "SELECT DISTINCT credits FROM courses ORDER BY 1"):
        yield _q(
            "courses_credits",
            1,
            f"List the titles of the courses worth {credits} credits.",
            f"SELECT title FROM courses WHERE credits = {credits}",
        )
    for year in (2000, 2005, 2010, 2015, 2020):
        yield _q(
            "hired_after",
            1,
            f"How many instructors were hired after {year}?",
            f"SELECT COUNT(*) FROM instructors WHERE hire_year > {year}",
        )
    for city in values(con, "SELECT DISTINCT city FROM students ORDER BY 1"):
        yield _q(
            "students_city",
            1,
            f"How many students come from {city}?",
            f"SELECT COUNT(*) FROM students WHERE city = {lit(city)}",
        )
    for dept in values(con, "SELECT name FROM departments ORDER BY 1"):
        yield _q(
            "dept_budget",
            1,
            f"What is the budget of the {dept} department?",
            f"SELECT budget FROM departments WHERE name = {lit(dept)}",
        )
        yield _q(
            "majors_in_dept",
            2,
            f"How many students major in {dept}?",
            "SELECT COUNT(*) FROM students s JOIN departments d ON s.major_dept_id = d.dept_id "
            f"WHERE d.name = {lit(dept)}",
        )
        yield _q(
            "instructors_in_dept",
            2,
            f"List the first and last names of the instructors in the {dept} department.",
            "SELECT i.first_name, i.last_name FROM instructors i JOIN departments d ON i.dept_id = d.dept_id "
            f"WHERE d.name = {lit(dept)}",
        )
        yield _q(
            "avg_salary_dept",
            2,
            f"What is the average salary of the instructors in the {dept} department? Round to 2 decimal places.",
            "SELECT ROUND(AVG(i.salary), 2) FROM instructors i JOIN departments d ON i.dept_id = d.dept_id "
            f"WHERE d.name = {lit(dept)}",
        )
        yield _q(
            "a_students_in_dept",
            3,
            f"List the first and last names of the students who received an A in at least one course of the "
            f"{dept} department (each name once).",
            "SELECT DISTINCT s.first_name, s.last_name FROM students s JOIN enrollments e ON "
            "e.student_id = s.student_id JOIN courses c ON c.course_id = e.course_id JOIN departments d ON "
            f"d.dept_id = c.dept_id WHERE e.grade = 'A' AND d.name = {lit(dept)}",
        )
        yield _q(
            "top_course_dept",
            3,
            f"Which course of the {dept} department has the most enrolled students? Give its code.",
            "SELECT c.code FROM courses c JOIN departments d ON d.dept_id = c.dept_id JOIN enrollments e ON "
            f"e.course_id = c.course_id WHERE d.name = {lit(dept)} GROUP BY c.course_id "
            "ORDER BY COUNT(*) DESC LIMIT 1",
            ordered=True,
            limit=1,
            tie_sql="SELECT COUNT(*) FROM courses c JOIN departments d ON d.dept_id = c.dept_id JOIN enrollments e "
            f"ON e.course_id = c.course_id WHERE d.name = {lit(dept)} GROUP BY c.course_id ORDER BY 1 DESC",
        )
        yield _q(
            "idle_majors",
            3,
            f"How many students majoring in {dept} are not enrolled in any course?",
            "SELECT COUNT(*) FROM students s JOIN departments d ON s.major_dept_id = d.dept_id "
            f"WHERE d.name = {lit(dept)} AND s.student_id NOT IN (SELECT student_id FROM enrollments)",
        )
        yield _q(
            "dept_credits_taken",
            3,
            f"What is the total number of credits of all enrollments in courses of the {dept} department?",
            "SELECT SUM(c.credits) FROM enrollments e JOIN courses c ON c.course_id = e.course_id "
            f"JOIN departments d ON d.dept_id = c.dept_id WHERE d.name = {lit(dept)}",
        )
    for code in values(con, "SELECT code FROM courses ORDER BY 1"):
        yield _q(
            "enrolled_in_course",
            2,
            f"How many students are enrolled in the course {code}?",
            "SELECT COUNT(*) FROM enrollments e JOIN courses c ON e.course_id = c.course_id "
            f"WHERE c.code = {lit(code)}",
        )
    yield _q(
        "dept_most_majors",
        3,
        "Which department has the most students majoring in it? Give its name.",
        "SELECT d.name FROM departments d JOIN students s ON s.major_dept_id = d.dept_id GROUP BY d.dept_id "
        "ORDER BY COUNT(*) DESC LIMIT 1",
        ordered=True,
        limit=1,
        tie_sql="SELECT COUNT(*) FROM students WHERE major_dept_id IS NOT NULL GROUP BY major_dept_id ORDER BY 1 DESC",
    )
    for k in (3, 5):
        yield _q(
            "top_courses",
            3,
            f"Which {k} courses have the most enrolled students? List the course codes, the most enrolled first.",
            "SELECT c.code FROM courses c JOIN enrollments e ON e.course_id = c.course_id GROUP BY c.course_id "
            f"ORDER BY COUNT(*) DESC LIMIT {k}",
            ordered=True,
            limit=k,
            tie_sql="SELECT COUNT(*) FROM enrollments GROUP BY course_id ORDER BY 1 DESC",
        )
    yield _q(
        "unenrolled_students",
        3,
        "How many students are not enrolled in any course?",
        "SELECT COUNT(*) FROM students WHERE student_id NOT IN (SELECT student_id FROM enrollments)",
    )
    yield _q(
        "idle_instructors",
        3,
        "List the first and last names of the instructors who teach no course.",
        "SELECT first_name, last_name FROM instructors WHERE instructor_id NOT IN "
        "(SELECT instructor_id FROM courses WHERE instructor_id IS NOT NULL)",
    )
    yield _q(
        "rich_departments",
        3,
        "List the names of the departments whose instructors' average salary is above the average salary "
        "of all instructors.",
        "SELECT d.name FROM departments d JOIN instructors i ON i.dept_id = d.dept_id GROUP BY d.dept_id "
        "HAVING AVG(i.salary) > (SELECT AVG(salary) FROM instructors)",
    )
